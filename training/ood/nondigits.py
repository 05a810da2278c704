"""Non-digit image sets for the "not a digit" score, generated here (no downloads), seeded.

Every image is drawn on its own canvas and passed through the service's preprocessing (`service.imaging.preprocess`),
exactly as an upload would be. Each role has its own fonts and generators: `NONDIGIT_SETS` fit the pattern network
(role `network`, another stream) and the combiner, and a CapsNet trains on them as "no digit" (role `exposure`,
another stream: `capsnet-train --exposure`); `VALIDATION_SETS` choose the detector; `TEST_SETS` are reported
once and share no font, generator or letter of another script with any other role (the shapes of `training.ood.unseen`);
`CONFIRMATION_SETS` check a served card later (`capsnet-ood --confirm`). docs/not-a-digit.md lists them. Glyph
twins of digits (O, I, l, S, Z, B, G, o, s, z, b, g, q; iota, theta, be, che, vav; Thai ro and o ang; Arabic
waw, ha and mim; Devanagari ra and da; Myanmar wa and da; Kannada ra and la; N'Ko a and o; Thaana haa and vaavu;
Mongolian ba and ja, ...) are in no set, and a character is drawn only in the fonts that have its glyph.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from service.contract import preprocess
from training.ood import pictures, shapes, surfaces, unseen
from training.ood.shapes import CANVAS, elastic

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
FONT_FILES = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSans-Bold.ttf")
FONT_PACKAGE = "fonts-dejavu-core"
VARIED_FONT_FILES = (  # and fonts-dejavu-extra: the other faces of the same family, for fitting only
    *FONT_FILES,
    "DejaVuSans-Oblique.ttf", "DejaVuSans-BoldOblique.ttf", "DejaVuSans-ExtraLight.ttf", "DejaVuSansCondensed.ttf",
    "DejaVuSansCondensed-Bold.ttf", "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSerif-Italic.ttf",
    "DejaVuSerif-Bold.ttf", "DejaVuSerifCondensed.ttf", "DejaVuSerifCondensed-BoldItalic.ttf",
)  # fmt: skip
VARIED_FONT_PACKAGE = "fonts-dejavu-extra"
LETTERS = "ACDEFHJKLMNPQRTUVWXYacdefhijkmnprtuvwxy"  # no glyph twins of digits
HARD_LETTERS = "ADHJLQacfhijty"  # those the version 5 cards took for digits most often (read as 1, 0 or 4)
SYMBOLS = "+−×÷=%#@&*?<>~^"  # no bars, slashes or brackets: after cropping they are ones
SCRIPTS_FIT = (  # Greek, Cyrillic and Hebrew letters; no digit twins
    "ξζηκνρστυГИЙКУЦЭгийкуцэשאמצםαβγλμπφχψωΓΔΛΞΠΣΦΨΩжфшщыюяЖФШЩЫЮЯдлпגדהכלנעפקרת"
)
SCRIPTS_MORE = (  # Thai, Hangul, Ethiopic, Devanagari, Arabic, Bengali, Tamil, Khmer, CJK: fitting only; no twins
    "กขคฆฉชซญฎฏฐฑฒณดตถทนบปผฝพฟภมยศษสหฬ" "한글국어말사람나무하늘바다강산별달꽃"
    "ሀለሐመሠሰሸቀበተቸኀነኘአከኸወዘዠየደጀጠጨጰጸፀፈፐ" "कखगघङचछजझञणतथधनपफबभमयलवशषसह" "بتثجحخسشصضطظفقكلني"
    "অআকখগঘচছজঝঞটথদধনপফভমযলশষসহ" "அஆஇஈஐஞடணதநபமயலவழளறன" "កគឃងឆជឈញដឋណតថធបផពភមយលសហឡអ"
    "漢字語書読電鳥森林学校海空雪風花草島館様識議護響驚龍鬱門問間黒線"
)  # fmt: skip
SCRIPTS_WORLD = (  # Armenian, Georgian, Gujarati, Sinhala, Malayalam, Lao, Gurmukhi, Oriya, Canadian syllabics,
    # Tifinagh, Syriac, Javanese and Vai (without the letters the version 5 card took for digits); Telugu, Cherokee,
    # Tibetan, Yi, Ol Chiki, Meetei Mayek, Myanmar, Lepcha, Tai Viet (its low-tone letters), Kannada, N'Ko and Adlam:
    # fitting only; no twins
    "ԱԲԴԵԷԸԹԺԻԼԽԿՀՂՃՄՆՇՈՊՌՍՎՐՒՓՔաբդեէըթժիխկհղմյնոպռսվտրփք" "ადეთიკლოჟრსტუფქღყჩცძჭხჯ"
    "અઆઇઈઋઍકખગછજઝઞણતથદધનફબભમલળશષસહ" "ආඇඈඉඊඋඒඔඕකඛගඝඞඡජඣඤටඨඩඪණතධනපබභමයරලශෂසහළ"
    "അആഇഈഉഊഎഏഐഓഔകഖഗഘങചഛജഝഞഡഢണതഥധനപഫബഭമയരലളഴവശഷസഹ" "ກຄງຊຍຕຖທນບປຜຝພຟມຢວສຫ"
    "ਅਆਇਈਉਊਏਐਔਖਗਘਚਛਜਝਞਟਠਢਣਥਦਧਨਫਬਭਮਯਰਵਸ਼ਸਹ" "ଅଆଇଈଉଊଋଏଐଔକଖଗଘଙଚଛଜଝଞଟଡଢଣତଥଦଧନପଫବଭମଯରଲଳଶଷସହ"
    "ᐁᐃᐄᐅᐯᐱᐳᐸᑌᑎᑐᑕᑭᑯᒋᒍᒐᒥᒧᒪᓀᓂᓄᓇᓭᓯᓱᓴᔨᔪᕃᕆᕈᕓᕕᕙᖃᖅᖏ" "ⴱⴳⴷⴹⴻⴼⴽⵀⵃⵄⵅⵇⵉⵊⵍⵎⵓⵕⵙⵜⵟⵡⵣⵥ" "ܐܒܓܗܘܚܛܟܠܡܢܣܥܦܩܫܬ"
    "ꦄꦅꦆꦇꦈꦉꦊꦋꦌꦍꦎꦏꦐꦑꦒꦓꦔꦕꦖꦗꦘꦙꦚꦛꦜꦝꦞꦟꦠꦡꦢꦣꦤꦥꦦꦧꦨꦩꦪꦫꦬꦭꦮꦯꦰꦱꦲ" "ꔀꔁꔂꔃꔄꔅꔆꔈꔉꔊꔋꔌꔍꔐꔑꔔꔕꔖꔗꔘꔙꔚꔛꔜꔝꔞꔟꔠꔣꔤꔥꔦꔧꔨꔩ"
    "అఆఇఈఉఊఋఏఐఓఔకఖగఘఙచఛజఝఞటఠడఢణతథదధనపఫబభమయరఱలళవశషసహ"
    "ᎠᎡᎢᎣᎤᎥᎨᎩᎪᎫᎬᎭᎮᎯᎰᎱᎲᎳᎵᎷᎸᎹᎻᎽᎿᏁᏂᏅᏇᏈᏉᏊᏌᏍᏐᏑᏒᏔᏖᏗᏘᏙᏛᏝᏞᏟᏠᏡᏢᏣᏤᏥᏦᏨᏪᏬᏯᏱᏲ" "ཀཁགངཆཇནཔཕབམཙཚཛཝཟའཡརལསཨ"
    "ꀀꀓꁌꁟꁲꂅꂘꂫꂾꃑꃤꃷꄊꄝꄰꅃꅖꅩꅼꆏꆢꆵꇈꇛꇮꈁꈺꉳꊆꊬꊿꋥꋸꌋꌞꌱꍄꍪꍽꎐꎣꎶꏜꏯꐂꐕꐨꐻꑎꑡꑴꒇ"
    "ᱞᱡᱢᱤᱥᱦᱫᱬᱴᱶ" "ꯀꯁꯂꯃꯄꯅꯆꯇꯈꯉꯊꯋꯌꯍꯎꯏꯐꯑꯒꯓꯗꯘꯙꯚ"
    "ကဂဃငဆဈညဋဎဏတပဖဗဘမယလသဟအ" "ᰀᰂᰃᰄᰇᰉᰋᰐᰑᰔᰕᰖᰗᰘᰙᰜᰝᰞᰠᰢ" "ꪀꪂꪄꪈꪊꪌꪎꪐꪒꪔꪘꪚꪜꪞꪠꪢꪦꪨꪪꪬ"
    "ಅಆಈಉಊಋಐಕಘಙಚಛಜಝಞಢಣಥಧನಪಫಬಭಮಯವಶಷಸಹ" "ߌߍߎߓߔߘߙߚߜߠߡߪ" "𞤂𞤄𞤅𞤆𞤇𞤈𞤊𞤋𞤌𞤏𞤓𞤔𞤕𞤚𞤜𞤝𞤞𞤟𞤡𞤦𞤧𞤪𞤬𞤭𞤮𞤱𞤵𞤶𞤷𞤼𞤾𞤿𞥁𞥃"
)  # fmt: skip
SCRIPTS = (  # Thaana and Mongolian letters (Todo and Manchu ones too) the fitting never draws; no digit twins
    "ށނރކދތޏޔޘޝޞޟޠޡ" "ᠠᠢᠧᠩᠾᡄᡅᡍᡎᡙᡢᡤᡥᡫᡳᡶ"
)  # fmt: skip
FONT_ROOT = Path("/usr/share/fonts")
FIT_FONTS = (  # FreeFont, Humor Sans, Comic Neue, URW base 35, handwriting, 96 families more (22 handwriting-like)
    "truetype/freefont/FreeSans.ttf", "truetype/freefont/FreeSerif.ttf", "truetype/freefont/FreeMono.ttf",
    "truetype/freefont/FreeSansBold.ttf", "truetype/freefont/FreeSerifItalic.ttf",
    "truetype/humor-sans/Humor-Sans.ttf", "opentype/comic-neue/ComicNeue-Regular.otf",
    "opentype/comic-neue/ComicNeue-Bold.otf",
    "opentype/urw-base35/NimbusSans-Regular.otf", "opentype/urw-base35/NimbusRoman-Regular.otf",
    "opentype/urw-base35/NimbusMonoPS-Regular.otf", "opentype/urw-base35/NimbusSans-Bold.otf",
    "opentype/urw-base35/URWGothic-Book.otf", "opentype/urw-base35/URWBookman-Light.otf",
    "opentype/urw-base35/C059-Roman.otf", "opentype/urw-base35/P052-Italic.otf",
    "truetype/breip/Breip.ttf", "truetype/fifthhorseman/dkg.ttf", "truetype/femkeklaver/femkeklaver.ttf",
    "truetype/crosextra/Carlito-Regular.ttf", "truetype/crosextra/Carlito-Bold.ttf",
    "truetype/crosextra/Caladea-Regular.ttf", "truetype/open-sans/OpenSans-Regular.ttf",
    "opentype/cantarell/Cantarell-Regular.otf", "opentype/ebgaramond/EBGaramond12-Regular.otf",
    "truetype/tlwg/Purisa.ttf", "truetype/andika/Andika-Regular.ttf", "truetype/comfortaa/Comfortaa-Regular.ttf",
    "truetype/gentium/Gentium-R.ttf", "truetype/ezra/SILEOT.ttf",

    "truetype/lato/Lato-Regular.ttf", "opentype/inter/Inter-Regular.otf", "opentype/cabin/Cabin-Regular.otf",
    "truetype/karla/Karla-Regular.otf", "truetype/adf/GilliusADF-Regular.otf", "truetype/adf/BaskervaldADFStd.otf",
    "opentype/jura/Jura-Regular.otf", "opentype/dosis/Dosis-Book.otf", "truetype/lindenhill/LindenHill.otf",
    "truetype/averia-gwf/AveriaSansGWF-Regular.ttf", "truetype/ecolier-court/Ecolier-court.ttf",
    "truetype/klee/KleeOne-Regular.ttf", "opentype/bwht/BecauseWeLearn-Regular.otf",
    "opentype/bwht/BecauseWeCreate-Regular.otf", "opentype/kaushanscript/KaushanScript-Regular.otf",
    "truetype/cabinsketch/CabinSketch-Regular.ttf", "opentype/neohellenic/GFSNeohellenic.otf",
    "truetype/culmus/FrankRuehlCLM-Medium.ttf", "truetype/culmus/DavidCLM-Medium.otf",

    "truetype/roboto/unhinted/RobotoTTF/Roboto-Regular.ttf", "truetype/quicksand/Quicksand-Regular.ttf",
    "opentype/league-spartan/LeagueSpartan-Regular.otf", "truetype/vollkorn/Vollkorn-Regular.ttf",
    "truetype/fonts-oldstandard/OldStandard-Regular.ttf", "truetype/charis/CharisSIL-Regular.ttf",
    "opentype/sortsmill/GoudyBookletter1911.otf", "truetype/tuffy/Tuffy.ttf", "fonts-go/Go-Regular.ttf",
    "opentype/opendyslexic/OpenDyslexic-Regular.otf", "truetype/seto/setofont.ttf", "truetype/nanum/NanumPen.ttf",
    "truetype/nanum/NanumBrush.ttf", "opentype/lobstertwo/LobsterTwo-Regular.otf",
    "opentype/malayalam/Chilanka-Regular.otf", "truetype/tlwg/Sawasdee.ttf",

    "opentype/stix/STIXGeneral-Regular.otf", "truetype/cmu/cmunrm.ttf", "truetype/cmu/cmunti.ttf",
    "truetype/firacode/FiraCode-Regular.ttf", "truetype/manrope/Manrope-Regular.ttf",
    "truetype/tiresias/tiresias_infofont.ttf", "truetype/mononoki/mononoki-Regular.ttf",
    "truetype/beteckna/Beteckna.ttf", "truetype/staypuft/StayPuft.ttf", "opentype/junicode/JunicodeTwoBeta-Regular.otf",
    "truetype/fonts-yrsa-rasa/Yrsa-Regular.ttf", "truetype/isabella/Isabella.ttf",
    "truetype/blankenburg/Blankenburg_UNZ1A.ttf", "truetype/leckerli-one/LeckerliOne-Regular.ttf",
    "opentype/havana/Havana-Regular.otf", "truetype/yusei-magic/YuseiMagic-Regular.ttf",
    "truetype/sjfonts/Delphine.ttf", "truetype/sjfonts/SteveHand.ttf",

    "truetype/fonts-century-catalogue/Century-Catalogue.ttf", "opentype/fonts-prociono/Prociono.otf",
    "truetype/fanwood/Fanwood.otf", "truetype/adf/AccanthisADFStd-Regular.otf", "truetype/okolaks/okolaksRegular.ttf",
    "truetype/ocr-a/OCRA.ttf", "opentype/yanone-kaffeesatz/YanoneKaffeesatz-Regular.otf",
    "opentype/junction/Junction.otf", "opentype/didot/GFSDidot.otf", "truetype/noto/NotoSerif-Regular.ttf",
    "truetype/noto/NotoSerif-Italic.ttf", "opentype/fantasque-sans/LargeLineHeight/OTF/FantasqueSansMono-Regular.otf",
    "opentype/levien/TypoScript.otf", "truetype/yozvox-yozfont/YOzRN_.ttf", "truetype/yozvox-yozfont/YOzBEF.ttf",

    "truetype/paratype/PTS55F.ttf", "truetype/paratype/PTF55F.ttf", "truetype/anonymous-pro/Anonymous Pro.ttf",
    "truetype/jetbrains-mono/JetBrainsMono-Regular.ttf", "truetype/adf/BerenisADFPro-Regular.otf",
    "opentype/radisnoir/RadisSans-medium.otf", "truetype/adf/LibrisADFStd-Regular.otf",
    "truetype/adf/OldaniaADFStd-Regular.otf", "opentype/play/Play-Regular.otf", "truetype/inconsolata/Inconsolata.otf",
    "opentype/gemunu-libre/GemunuLibre-Regular.otf", "truetype/dustin/Domestic_Manners.ttf",
    "truetype/dustin/El_Abogado_Loco.ttf", "truetype/adf/RomandeADFScriptStd-Italic.otf",

    "truetype/hermit/Hermit-medium.otf", "opentype/b612/B612-Regular.otf", "truetype/cardo/Cardo104s.ttf",
    "opentype/mplus/Mplus1-Regular.otf", "truetype/oxygen/Oxygen-Sans.ttf", "truetype/monoid/Monoid-Regular.ttf",
    "truetype/agave/agave-r-autohinted.ttf", "opentype/sora/Sora-Regular.otf",
    "truetype/gnutypewriter/GNUTypewriter.ttf", "truetype/klaudia-berenika/Berenika.ttf",
    "truetype/klaudia-berenika/Klaudia-Bold.ttf", "truetype/kiloji/kiloji.ttf",
    "truetype/kouzan-mouhitsu/kouzan-mouhitsu.ttf", "truetype/aoyagi-soseki/aoyagi-soseki.ttf",

    "truetype/clear-sans/ClearSans-Regular.ttf", "truetype/eurofurence/eurof55.ttf",
    "truetype/routed-gothic/routed-gothic.ttf", "opentype/quattrocento/Quattrocento-Regular.otf",
    "opentype/arapey/Arapey-Regular.otf", "opentype/elstob/ElstobD-Regular.otf",
    "truetype/adf/IrianisADFStd-Regular.otf", "truetype/3270/3270-Regular.ttf", "truetype/monofur/monof55.ttf",
    "opentype/compagnon/Compagnon-Roman.otf", "truetype/engadget/Engadget.ttf",
    "opentype/bajaderka/Bajaderka-Regular.otf", "truetype/woowa-bm/BMKIRANGHAERANG-TTF.ttf",
    "truetype/woowa-bm/BMYEONSUNG_ttf.ttf",

    "opentype/allerta/allerta_medium.otf", "truetype/adf/UniversalisADFStd-Regular.otf",
    "truetype/bizud-gothic/BIZUDGothic-Regular.ttf", "opentype/national-park/NationalPark-Regular.otf",
    "truetype/doulos/DoulosSIL-Regular.ttf", "truetype/essays1743/Essays1743.ttf", "truetype/mph-2b-damase/damase.ttf",
    "opentype/ocr-b/OCRB.otf", "truetype/naver-d2coding/D2Coding-Ver1.3.2-20180524-all.ttc",
    "opentype/league-mono/LeagueMono-Regular.otf", "truetype/adf/MekanusADFStd-Regular.otf",
    "truetype/osifont/osifont.ttf", "truetype/unfonts-extra/UnPilgia.ttf", "opentype/cherrybomb/CherryBomb-Regular.otf",
)  # fmt: skip
SCRIPT_FIT_FONTS = (  # Thai, Korean, Ethiopic, Devanagari, Arabic; Bengali, Tamil, Khmer and Chinese
    "truetype/tlwg/Loma.ttf", "truetype/tlwg/Kinnari.ttf", "truetype/unfonts-core/UnBatang.ttf",
    "truetype/unfonts-core/UnDotum.ttf", "truetype/nanum/NanumMyeongjo.ttf",
    "truetype/abyssinica/AbyssinicaSIL-Regular.ttf", "truetype/lohit-devanagari/Lohit-Devanagari.ttf",
    "opentype/fonts-hosny-amiri/Amiri-Regular.ttf",
    "truetype/lohit-bengali/Lohit-Bengali.ttf", "truetype/lohit-tamil/Lohit-Tamil.ttf",
    "truetype/khmeros/KhmerOS.ttf", "truetype/khmeros/KhmerOSbattambang.ttf", "truetype/wqy/wqy-zenhei.ttc",
    "truetype/arphic/ukai.ttc",
)  # fmt: skip
VALIDATION_FONTS = (  # fonts-liberation
    "truetype/liberation/LiberationSans-Regular.ttf",
    "truetype/liberation/LiberationSerif-Regular.ttf",
    "truetype/liberation/LiberationMono-Regular.ttf",
    "truetype/liberation/LiberationSans-Bold.ttf",
)
VALIDATION_HANDWRITING = (  # fonts-rufscript, fonts-tomsontalks, fonts-urw-base35
    "truetype/rufscript/Rufscript010.ttf",
    "truetype/tomsontalks/TomsonTalks.ttf",
    "opentype/urw-base35/Z003-MediumItalic.otf",
)
WORLD_FONTS = (  # Armenian (Noto), Georgian (Noto, BPG), Gujarati (Lohit, Kalapi, Samyak), Telugu (Noto,
    # Gurajada, Ramabhadra), Tibetan (Noto, DDC Uchen, Tibetan Machine), Yi (Nuosu SIL, Noto), Ol Chiki (Uniol,
    # Noto), Meetei Mayek (Eeyek, Noto), Myanmar (Padauk, Noto), Lepcha (Mingzat, Noto), Tai Viet (Tai Heritage Pro,
    # Noto), Kannada (Noto, Gubbi), N'Ko (Noto, Conakry), Adlam (Noto, Noto Unjoined); the others in Noto
    "truetype/noto/NotoSansArmenian-Regular.ttf", "truetype/noto/NotoSerifArmenian-Regular.ttf",
    "truetype/noto/NotoSansGeorgian-Regular.ttf", "truetype/fonts-bpg-georgian/BPG_Glaho_GPL&GNU.ttf",
    "truetype/fonts-bpg-georgian/BPG_Ingiri_GPL&GNU.ttf", "truetype/lohit-gujarati/Lohit-Gujarati.ttf",
    "truetype/fonts-kalapi/Kalapi.ttf", "truetype/samyak-fonts/Samyak-Gujarati.ttf",
    "truetype/noto/NotoSansSinhala-Regular.ttf", "truetype/noto/NotoSerifSinhala-Regular.ttf",
    "truetype/noto/NotoSansMalayalam-Regular.ttf", "truetype/noto/NotoSerifMalayalam-Regular.ttf",
    "truetype/noto/NotoSansLao-Regular.ttf", "truetype/noto/NotoSerifLao-Regular.ttf",
    "truetype/noto/NotoSansGurmukhi-Regular.ttf", "truetype/noto/NotoSerifGurmukhi-Regular.ttf",
    "truetype/noto/NotoSansOriya-Regular.ttf", "truetype/noto/NotoSansCanadianAboriginal-Regular.ttf",
    "truetype/noto/NotoSansTifinagh-Regular.ttf", "truetype/noto/NotoSansSyriac-Regular.ttf",
    "truetype/noto/NotoSansJavanese-Regular.ttf", "truetype/noto/NotoSansVai-Regular.ttf",
    "truetype/noto/NotoSansTelugu-Regular.ttf", "truetype/noto/NotoSerifTelugu-Regular.ttf",
    "truetype/teluguvijayam/Gurajada.ttf", "truetype/teluguvijayam/ramabhadra.ttf",
    "truetype/noto/NotoSansCherokee-Regular.ttf", "truetype/noto/NotoSerifTibetan-Regular.ttf",
    "truetype/tibetan/DDC_Uchen.ttf", "truetype/tibetan-machine/TibetanMachineUni.ttf",
    "truetype/nuosusil/NuosuSIL-Regular.ttf", "truetype/noto/NotoSansYi-Regular.ttf", "truetype/uniol/Uniol.ttf",
    "truetype/noto/NotoSansOlChiki-Regular.ttf", "truetype/eeyek/Eeyek-Regular.ttf",
    "truetype/noto/NotoSansMeeteiMayek-Regular.ttf", "truetype/padauk/Padauk-Regular.ttf",
    "truetype/noto/NotoSansMyanmar-Regular.ttf", "truetype/mingzat/Mingzat-Regular.ttf",
    "truetype/noto/NotoSansLepcha-Regular.ttf", "truetype/taiheritagepro/TaiHeritagePro-Regular.ttf",
    "truetype/noto/NotoSansTaiViet-Regular.ttf", "truetype/noto/NotoSansKannada-Regular.ttf",
    "truetype/Gubbi/Gubbi.ttf", "truetype/noto/NotoSansNKo-Regular.ttf", "truetype/evertype-conakry/Conakry.ttf",
    "truetype/noto/NotoSansAdlam-Regular.ttf", "truetype/noto/NotoSansAdlamUnjoined-Regular.ttf",
)  # fmt: skip
TEST_FONTS = (  # typefaces no other role uses: sans (Ikarius ADF, Millimetre, Cupola, Summersby), serif (Caslon,
    # Galatia SIL, Emerita Latina), mono (IBM VGA 8x16, GW Monospace, Konatu Tohaba), slab (Oradano Mincho's Latin, a
    # worn letterpress face); the last three are handwriting-like (Ænigma Scrawl, Johnny Mac Scrawl, Hand Me Down)
    "truetype/adf/IkariusADFStd-Regular.otf", "opentype/millimetre/millimetreA 01.otf",
    "truetype/fonts-georgewilliams/Cupola.ttf", "truetype/summersby/summersby.ttf",
    "truetype/fonts-georgewilliams/CaslonRoman.ttf", "truetype/galatia/GalSILR.ttf",
    "truetype/linex/emerita_latina.ttf", "pc/Px_IBM_VGA8.ttf", "truetype/fonts-georgewilliams/GWMonospace.ttf",
    "truetype/konatu/KonatuTohaba.ttf", "truetype/oradano-mincho/OradanoGSRR.ttf", "truetype/aenigma/aescrawl.ttf",
    "truetype/aenigma/jmacscrl.ttf", "truetype/aenigma/handmeds.ttf",
)  # fmt: skip
SCRIPT_FONTS = (  # Thaana (Noto Sans Thaana, regular and bold: Debian's other Thaana faces are fitting fonts or
    # Unifont's pixels), Mongolian (Noto, Manchu Font)
    "truetype/noto/NotoSansThaana-Regular.ttf", "truetype/noto/NotoSansThaana-Bold.ttf",
    "truetype/noto/NotoSansMongolian-Regular.ttf", "truetype/manchufont/ManchuFont.ttf",
)  # fmt: skip
CONFIRMATION_FONTS = (  # fonts-linuxlibertine
    "opentype/linux-libertine/LinLibertine_R.otf", "opentype/linux-libertine/LinLibertine_RI.otf",
    "opentype/linux-libertine/LinLibertine_RB.otf", "opentype/linux-libertine/LinBiolinum_R.otf",
    "opentype/linux-libertine/LinBiolinum_RB.otf",
)  # fmt: skip
CONFIRMATION_HANDWRITING = (  # fonts-kristi, fonts-dancingscript
    "truetype/kristi/Kristi.ttf",
    "opentype/dancingscript/DancingScript-Regular.otf",
    "opentype/dancingscript/DancingScript-Bold.otf",
)
FONT_PACKAGES = {  # the Debian package of each font folder (or file), to name in an error
    "freefont": "fonts-freefont-ttf", "humor-sans": "fonts-humor-sans", "comic-neue": "fonts-comic-neue",
    "urw-base35": "fonts-urw-base35", "breip": "fonts-breip", "fifthhorseman": "fonts-dkg-handwriting",
    "femkeklaver": "fonts-femkeklaver", "liberation": "fonts-liberation", "rufscript": "fonts-rufscript",
    "tomsontalks": "fonts-tomsontalks", "crosextra": "fonts-crosextra-carlito fonts-crosextra-caladea",
    "open-sans": "fonts-open-sans", "cantarell": "fonts-cantarell", "ebgaramond": "fonts-ebgaramond",
    "Purisa.ttf": "fonts-tlwg-purisa-ttf", "Loma.ttf": "fonts-tlwg-loma-ttf", "Kinnari.ttf": "fonts-tlwg-kinnari-ttf",
    "Sawasdee.ttf": "fonts-tlwg-sawasdee-ttf", "andika": "fonts-sil-andika", "comfortaa": "fonts-comfortaa",
    "gentium": "fonts-sil-gentium", "ezra": "fonts-sil-ezra", "linux-libertine": "fonts-linuxlibertine",
    "kristi": "fonts-kristi", "dancingscript": "fonts-dancingscript", "lato": "fonts-lato", "inter": "fonts-inter",
    "cabin": "fonts-cabin", "karla": "fonts-karla", "adf": "fonts-adf-gillius fonts-adf-baskervald",
    "jura": "fonts-jura", "dosis": "fonts-dosis", "lindenhill": "fonts-lindenhill",
    "averia-gwf": "fonts-averia-sans-gwf", "ecolier-court": "fonts-ecolier-court", "klee": "fonts-klee",
    "bwht": "fonts-bwht", "kaushanscript": "fonts-kaushanscript", "cabinsketch": "fonts-cabinsketch",
    "neohellenic": "fonts-gfs-neohellenic", "culmus": "culmus", "roboto": "fonts-roboto-unhinted",
    "quicksand": "fonts-quicksand", "league-spartan": "fonts-league-spartan", "vollkorn": "fonts-vollkorn",
    "fonts-oldstandard": "fonts-oldstandard", "charis": "fonts-sil-charis", "sortsmill": "fonts-goudybookletter",
    "tuffy": "fonts-tuffy", "fonts-go": "fonts-go", "opendyslexic": "fonts-opendyslexic", "seto": "fonts-seto",
    "nanum": "fonts-nanum fonts-nanum-extra", "lobstertwo": "fonts-lobstertwo", "malayalam": "fonts-smc-chilanka",
    "unfonts-core": "fonts-unfonts-core", "abyssinica": "fonts-sil-abyssinica",
    "lohit-devanagari": "fonts-lohit-deva", "fonts-hosny-amiri": "fonts-hosny-amiri",
    "stix": "fonts-stix", "cmu": "fonts-cmu", "firacode": "fonts-firacode", "manrope": "fonts-manrope",
    "tiresias": "fonts-tiresias", "mononoki": "fonts-mononoki", "beteckna": "fonts-beteckna",
    "staypuft": "fonts-staypuft", "junicode": "fonts-junicode", "fonts-yrsa-rasa": "fonts-yrsa-rasa",
    "isabella": "fonts-isabella", "blankenburg": "fonts-blankenburg", "leckerli-one": "fonts-leckerli-one",
    "havana": "fonts-havana", "yusei-magic": "fonts-yusei-magic", "sjfonts": "fonts-sjfonts",
    "lohit-bengali": "fonts-lohit-beng-bengali", "lohit-tamil": "fonts-lohit-taml", "khmeros": "fonts-khmeros",
    "wqy": "fonts-wqy-zenhei", "arphic": "fonts-arphic-ukai",
    "fonts-century-catalogue": "fonts-century-catalogue", "fonts-prociono": "fonts-prociono",
    "fanwood": "fonts-fanwood",
    "AccanthisADFStd-Regular.otf": "fonts-adf-accanthis", "okolaks": "fonts-okolaks", "ocr-a": "fonts-ocr-a",
    "yanone-kaffeesatz": "fonts-yanone-kaffeesatz", "junction": "fonts-junction", "didot": "fonts-gfs-didot",
    "noto": "fonts-noto-core", "fantasque-sans": "fonts-fantasque-sans", "levien": "fonts-levien-typoscript",
    "YOzRN_.ttf": "fonts-yozvox-yozfont-new-kana", "YOzBEF.ttf": "fonts-yozvox-yozfont-edu",
    "fonts-bpg-georgian": "fonts-bpg-georgian", "lohit-gujarati": "fonts-lohit-gujr", "fonts-kalapi": "fonts-kalapi",
    "samyak-fonts": "fonts-samyak-gujr", "paratype": "fonts-paratype", "anonymous-pro": "fonts-anonymous-pro",
    "jetbrains-mono": "fonts-jetbrains-mono", "BerenisADFPro-Regular.otf": "fonts-adf-berenis",
    "radisnoir": "fonts-radisnoir",
    "LibrisADFStd-Regular.otf": "fonts-adf-libris", "OldaniaADFStd-Regular.otf": "fonts-adf-oldania",
    "RomandeADFScriptStd-Italic.otf": "fonts-adf-romande", "play": "fonts-play", "inconsolata": "fonts-inconsolata",
    "gemunu-libre": "fonts-gemunu-libre", "dustin": "fonts-dustin",
    "teluguvijayam": "fonts-teluguvijayam", "tibetan": "fonts-ddc-uchen", "tibetan-machine": "fonts-tibetan-machine",
    "hermit": "fonts-hermit", "b612": "fonts-b612", "cardo": "fonts-cardo", "mplus": "fonts-mplus",
    "oxygen": "fonts-oxygen", "monoid": "fonts-monoid", "agave": "fonts-agave", "sora": "fonts-sora",
    "gnutypewriter": "fonts-gnutypewriter", "klaudia-berenika": "fonts-klaudia-berenika", "kiloji": "fonts-kiloji",
    "kouzan-mouhitsu": "fonts-kouzan-mouhitsu", "aoyagi-soseki": "fonts-aoyagi-soseki",
    "nuosusil": "fonts-sil-nuosusil", "uniol": "fonts-uniol", "eeyek": "fonts-eeyek",
    "clear-sans": "fonts-clear-sans", "eurofurence": "fonts-eurofurence", "routed-gothic": "fonts-routed-gothic",
    "quattrocento": "fonts-quattrocento", "arapey": "fonts-arapey", "elstob": "fonts-elstob",
    "IrianisADFStd-Regular.otf": "fonts-adf-irianis", "3270": "fonts-3270", "monofur": "fonts-monofur",
    "compagnon": "fonts-compagnon", "engadget": "fonts-engadget", "bajaderka": "fonts-bajaderka",
    "woowa-bm": "fonts-woowa-bm", "padauk": "fonts-sil-padauk", "mingzat": "fonts-sil-mingzat",
    "taiheritagepro": "fonts-sil-taiheritagepro", "allerta": "fonts-allerta",
    "UniversalisADFStd-Regular.otf": "fonts-adf-universalis", "bizud-gothic": "fonts-morisawa-bizud-gothic",
    "national-park": "fonts-national-park", "doulos": "fonts-sil-doulos", "essays1743": "fonts-essays1743",
    "mph-2b-damase": "fonts-mph-2b-damase", "ocr-b": "fonts-ocr-b", "naver-d2coding": "fonts-naver-d2coding",
    "league-mono": "fonts-league-mono", "MekanusADFStd-Regular.otf": "fonts-adf-mekanus", "osifont": "fonts-osifont",
    "unfonts-extra": "fonts-unfonts-extra", "cherrybomb": "fonts-cherrybomb", "Gubbi": "fonts-gubbi",
    "evertype-conakry": "fonts-evertype-conakry", "IkariusADFStd-Regular.otf": "fonts-adf-ikarius",
    "millimetre": "fonts-millimetre", "fonts-georgewilliams": "fonts-georgewilliams", "summersby": "fonts-summersby",
    "galatia": "fonts-sil-galatia", "linex": "fonts-linex", "pc": "fonts-pc", "konatu": "fonts-konatu",
    "oradano-mincho": "fonts-oradano-mincho-gsrr", "aenigma": "fonts-aenigma", "manchufont": "fonts-manchufont",
}  # fmt: skip
ALL_FONT_PACKAGES = " ".join(dict.fromkeys(" ".join(FONT_PACKAGES.values()).split()))


class FontMissing(FileNotFoundError):
    """A font a set draws with is not installed."""


def font_paths() -> list[Path]:
    paths = [FONT_DIR / name for name in FONT_FILES]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise FontMissing(f"letters need the DejaVu fonts ({FONT_PACKAGE}); missing {', '.join(map(str, missing))}")
    return paths


def varied_font_paths() -> list[Path]:
    paths = [FONT_DIR / name for name in VARIED_FONT_FILES]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise FontMissing(f"varied letters need {FONT_PACKAGE} and {VARIED_FONT_PACKAGE}; missing {missing[0]}")
    return paths


def package_of(name: str) -> str:
    """The Debian package of the font at `name` (under FONT_ROOT): its file's or nearest folder's, else "?"."""
    return next((FONT_PACKAGES[p] for p in reversed(Path(name).parts) if p in FONT_PACKAGES), "?")


def held_out_fonts(names: tuple[str, ...]) -> list[Path]:
    """The fonts of `names` (paths under FONT_ROOT); FontMissing names the Debian packages of those absent."""
    paths = [FONT_ROOT / name for name in names]
    missing = [(p, name) for p, name in zip(paths, names, strict=True) if not p.is_file()]
    if missing:
        packages = sorted({package_of(name) for _, name in missing})
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise FontMissing(f"these sets need Debian's {' '.join(packages)}; missing {missing[0][0]}{more}")
    return paths


@lru_cache(maxsize=512)
def load_font(path: Path, size: int) -> ImageFont.FreeTypeFont:
    """The font at `path` in `size` pixels, read once: the sets draw tens of thousands of glyphs from a few fonts."""
    return ImageFont.truetype(str(path), size)


def typeset(char: str, path: Path, size: int = 80) -> Image.Image:
    """`char` in the font at `path`, white on a black CANVAS x CANVAS canvas, centred."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    ImageDraw.Draw(canvas).text((CANVAS // 2, CANVAS // 2), char, fill=255, font=load_font(path, size), anchor="mm")
    return canvas


@lru_cache(maxsize=4096)
def has_glyph(path: Path, char: str) -> bool:
    """Whether the font draws `char` as itself, not as its missing-glyph box (compared with a private-use code)."""
    font = load_font(path, 40)
    drawn, missing = font.getmask(char), font.getmask("\U0010fffd")
    return not (drawn.size == missing.size and bytes(drawn) == bytes(missing))


def _pick(rng: np.random.Generator, chars: str, paths: list[Path]) -> tuple[str, Path]:
    """A character of `chars` and, among `paths`, a font that has its glyph (another character if none has)."""
    for _ in range(100):
        char = chars[rng.integers(len(chars))]
        fonts = [p for p in paths if has_glyph(p, char)]
        if fonts:
            return char, fonts[rng.integers(len(fonts))]
    drawable = "".join(c for c in chars if any(has_glyph(p, c) for p in paths))  # few: draw among those alone
    if not drawable:
        raise FontMissing(f"none of {', '.join(p.name for p in paths)} has a glyph of {chars!r}")
    return _pick(rng, drawable, paths)


def _glyph(rng: np.random.Generator, chars: str, paths: list[Path]) -> np.ndarray:
    """One character of `chars` in one of the fonts, 80 px on a 112 canvas, turned by up to 10 degrees."""
    canvas = typeset(*_pick(rng, chars, paths))
    return np.asarray(canvas.rotate(float(rng.uniform(-10, 10)), resample=Image.Resampling.BILINEAR)) / 255.0


def _letter(rng: np.random.Generator) -> np.ndarray:
    return np.asarray(typeset(*_pick(rng, LETTERS, font_paths()))) / 255.0


def varied(rng: np.random.Generator, chars: str, paths: list[Path]) -> np.ndarray:
    """A character in one of the fonts, then sheared by up to 0.3, turned by up to 15 degrees and thickened or
    thinned: the fitting letters vary as handwriting and other typefaces do."""
    char, path = _pick(rng, chars, paths)
    canvas = typeset(char, path, int(rng.integers(60, 90)))
    shear = float(rng.uniform(-0.3, 0.3))
    canvas = canvas.transform(canvas.size, Image.Transform.AFFINE, (1, shear, -shear * CANVAS / 2, 0, 1, 0),
                              resample=Image.Resampling.BILINEAR)  # fmt: skip
    canvas = canvas.rotate(float(rng.uniform(-15, 15)), resample=Image.Resampling.BILINEAR)
    size = int(rng.choice([0, 0, 3, 5, -3]))
    if size > 0:
        canvas = canvas.filter(ImageFilter.MaxFilter(size))
    elif size < 0:
        canvas = canvas.filter(ImageFilter.MinFilter(-size))
    return np.asarray(canvas) / 255.0


def _varied_letter(rng: np.random.Generator) -> np.ndarray:
    return varied(rng, LETTERS, varied_font_paths())


def _handwritten_letter(rng: np.random.Generator) -> np.ndarray:
    """A varied letter bent elastically: letters as a hand might draw them."""
    return elastic(varied(rng, LETTERS, varied_font_paths()), rng)


def _varied_symbol(rng: np.random.Generator) -> np.ndarray:
    return varied(rng, SYMBOLS + SCRIPTS_FIT, varied_font_paths())


def _symbol(rng: np.random.Generator) -> np.ndarray:
    return _glyph(rng, SYMBOLS, font_paths())


Draw = Callable[[np.random.Generator], np.ndarray]


def _fonts_set(chars: str, fonts: tuple[str, ...], how: str = "plain") -> Draw:
    """Characters in `fonts`: as typeset (plain), varied, or varied and bent (bent)."""

    def draw(rng: np.random.Generator) -> np.ndarray:
        paths = held_out_fonts(fonts)
        if how == "plain":
            return _glyph(rng, chars, paths)
        picture = varied(rng, chars, paths)
        return elastic(picture, rng) if how == "bent" else picture

    return draw


NONDIGIT_SETS: dict[str, Draw] = {
    "uniform": shapes.uniform,
    "gaussian": shapes.gaussian,
    "blank": shapes.blank,
    "near_blank": shapes.near_blank,
    "strokes": shapes.strokes,
    "letters": _letter,
    "textures": shapes.texture,
    "symbols": _symbol,
    "varied_letters": _varied_letter,
    "varied_symbols": _varied_symbol,
    "handwritten_letters": _handwritten_letter,
    "font_letters": _fonts_set(LETTERS, FIT_FONTS, "varied"),
    "bent_font_letters": _fonts_set(LETTERS, FIT_FONTS, "bent"),
    "font_symbols": _fonts_set(SYMBOLS + SCRIPTS_FIT, FIT_FONTS, "varied"),
    "scribbles": shapes.scribble,
    "gratings": shapes.grating,
    "noise": shapes.noise,
    "pen_strokes": shapes.pen_strokes,
    "doodles": shapes.doodles,
    "cells": shapes.cells,
    "field_noise": shapes.field_noise,
    "pages": shapes.pages,
    "dust": shapes.dust,
    "brush_strokes": shapes.brush_strokes,
    "spirographs": shapes.spirographs,
    "masonry": shapes.masonry,
    "block_noise": shapes.block_noise,
    "lit_pages": shapes.lit_pages,
    "sensor_noise": shapes.sensor_noise,
    "nib_strokes": shapes.nib_strokes,
    "knots": shapes.knots,
    "weaves": shapes.weaves,
    "scan_noise": shapes.scan_noise,
    "vignettes": shapes.vignettes,
    "stains": shapes.stains,
    "script_letters": _fonts_set(SCRIPTS_MORE, SCRIPT_FIT_FONTS, "varied"),
    "marks": shapes.marks,
    "sketches": shapes.sketches,
    "tilings": shapes.tilings,
    "codec_noise": shapes.codec_noise,
    "paper": shapes.paper,
    "notebook": shapes.notebook,
    "world_letters": _fonts_set(SCRIPTS_WORLD, WORLD_FONTS, "varied"),
    "signatures": pictures.signatures,
    "figures": pictures.figures,
    "halftones": pictures.halftones,
    "glitches": pictures.glitches,
    "fills": pictures.fills,
    "show_through": pictures.show_through,
    "zigzags": pictures.zigzags,
    "hatching": pictures.hatching,
    "plaids": pictures.plaids,
    "dithers": pictures.dithers,
    "checkerboards": pictures.checkerboards,
    "wiped_boards": pictures.wiped_boards,
    "typeset_letters": _fonts_set(LETTERS, FIT_FONTS),  # as typeset, turned by up to 10 degrees, as uploads come
    "hard_letters": _fonts_set(HARD_LETTERS, FIT_FONTS, "varied"),
    "waves": pictures.waves,
    "staves": pictures.staves,
    "terrazzo": pictures.terrazzo,
    "fax_noise": pictures.fax_noise,
    "empty_windows": pictures.empty_windows,
    "stamps": pictures.stamps,
    "solid_bars": pictures.solid_bars,
    "heartbeats": pictures.heartbeats,
    "crayons": pictures.crayons,
    "knits": pictures.knits,
    "tv_snow": pictures.tv_snow,
    "folded_sheets": pictures.folded_sheets,
    "crumpled": pictures.crumpled,
    "solid_shapes": pictures.solid_shapes,
    "seismograms": surfaces.seismograms,
    "pen_tests": surfaces.pen_tests,
    "wood_grain": surfaces.wood_grain,
    "thermal_prints": surfaces.thermal_prints,
    "envelopes": surfaces.envelopes,
    "pencil_ticks": surfaces.pencil_ticks,
}
VALIDATION_SETS: dict[str, Draw] = {  # another stream, other fonts
    "letters": _fonts_set(LETTERS, VALIDATION_FONTS),
    "symbols": _fonts_set(SYMBOLS, VALIDATION_FONTS),
    "bent_letters": _fonts_set(LETTERS, VALIDATION_FONTS, "bent"),  # as a hand might draw them
    "handwritten_letters": _fonts_set(LETTERS, VALIDATION_HANDWRITING),
    "strokes": shapes.strokes,
    "scribbles": shapes.scribble,
    "near_blank": shapes.near_blank,
    "textures": shapes.texture,
}
TEST_SETS: dict[str, Draw] = {  # fonts and generators used for nothing else
    "letters": _fonts_set(LETTERS, TEST_FONTS),
    "other_scripts": _fonts_set(SCRIPTS, SCRIPT_FONTS),
    "symbols": _fonts_set(SYMBOLS, TEST_FONTS),
    "strokes": unseen.circuit_traces,
    "scribbles": unseen.seams,
    "textures": unseen.raindrops,
    "noise": unseen.brushed_metal,
    "blank": unseen.blind_shadows,
    "near_blank": unseen.eraser_crumbs,
}
CONFIRMATION_SETS: dict[str, Draw] = {  # fonts used by nothing else
    "letters": _fonts_set(LETTERS, CONFIRMATION_FONTS),
    "handwritten_letters": _fonts_set(LETTERS, CONFIRMATION_HANDWRITING),
    "symbols": _fonts_set(SYMBOLS, CONFIRMATION_FONTS),
}
ROLES = {
    "fit": (NONDIGIT_SETS, 0),
    "validation": (VALIDATION_SETS, 1),
    "test": (TEST_SETS, 2),
    "confirmation": (CONFIRMATION_SETS, 3),
    "network": (NONDIGIT_SETS, 4),  # the fitting sets, other images: those the pattern network learns from
    "exposure": (NONDIGIT_SETS, 5),  # the fitting sets, other images: those a network trains on as "no digit"
}


def to_model_input(picture: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A picture (H, W) in [0, 1] as the service would feed it to a model of input `shape` (C, H, W)."""
    image = Image.fromarray((np.clip(picture, 0, 1) * 255).astype(np.uint8))
    return preprocess(image, (shape[-2], shape[-1])).array.reshape(shape).astype(np.float32)


def make_set(name: str, n: int, seed: int, shape: tuple[int, ...] = (1, 28, 28), role: str = "fit") -> np.ndarray:
    """n preprocessed images (n, *shape) of one set of a role (fit, network, exposure, validation, test,
    confirmation); the same (name, n, seed, role) always gives the same images, and each role draws from its own
    random stream."""
    sets, stream = ROLES[role]
    if name not in sets:
        raise ValueError(f"unknown {role} non-digit set {name!r}; choose one of {sorted(sets)}")
    draw = sets[name]
    key = [seed, list(sets).index(name)] if role == "fit" else [seed, list(sets).index(name), stream]
    rng = np.random.default_rng(key)
    return np.stack([to_model_input(draw(rng), shape) for _ in range(n)])


def rotated_digits(images: np.ndarray, labels: np.ndarray, quarter_turns: int) -> np.ndarray:
    """Digits (N, 1, H, W) turned by 90 degrees times `quarter_turns`, leaving out those that stay digits when turned:
    0, 1 and 8, and at 180 degrees also 6 and 9 (each other's turn)."""
    symmetric = {0, 1, 8} | ({6, 9} if quarter_turns % 4 == 2 else set())
    keep = ~np.isin(labels, list(symmetric))
    return np.ascontiguousarray(np.rot90(images[keep], quarter_turns, axes=(-2, -1)))
